"""CLI subcommands (see xmr.cli)."""
