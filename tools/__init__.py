"""Tools beside the harness: plain reference programs and the GPU experiment scripts."""
