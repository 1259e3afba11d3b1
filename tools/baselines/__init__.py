"""Plain reference programs and the tools that compare the harness against them."""
