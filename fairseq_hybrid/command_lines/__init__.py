"""The user's fairseq-train command line, as the package's commands take it:
split from their own options, parsed as fairseq parses it, and the options
the commands set themselves (refused from the user, or replaced)."""
