"""The command line: thin click commands over the library, one private module per command.

``ferry.cli.main`` is the entry point (``main``) and the click group (``cli``).
"""
