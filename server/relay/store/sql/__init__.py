"""The store's parts on any SQL database (a module per concept, written once in the SQL SQLite and PostgreSQL both
speak) and ``SQLStore``, which answers the ``Store`` protocol with them over one ``Database``."""
