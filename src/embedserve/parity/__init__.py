"""`embedserve parity`: the golden-parity release gate (reference vs candidate vectors, per length bucket)."""
