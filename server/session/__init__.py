"""A training session: the round loop (``session``), its settings (``config``), checkpoint files
(``checkpoint_files``), task packages (``package``), archiving a finished session (``archive``), the
in-process simulator (``simulator``), byte-pair tokenizer training (``bpe``) and plots (``plot``)."""
