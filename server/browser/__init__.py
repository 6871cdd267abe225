"""Browsers: where Debian's Chromium is (``chromium``), headless peers (``peers``), starting a relay process and
driving its page (``launcher``)."""
