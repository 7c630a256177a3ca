"""Tables and figures built from results files (never typed by hand)."""
