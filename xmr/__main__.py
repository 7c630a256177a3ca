from xmr.cli import entry_point

entry_point()
