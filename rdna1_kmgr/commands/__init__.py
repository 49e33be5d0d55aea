"""One module per command: each parses its options, calls the concept modules and prints."""
