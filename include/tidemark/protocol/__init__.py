"""The foundation every layer stands on: the spec, windows, control messages, records and their
encodings, totals, errors and the core's configuration. Imports nothing else of Tidemark."""
