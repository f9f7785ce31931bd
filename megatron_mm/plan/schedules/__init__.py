"""Pipeline schedules as data: the generators, the encoder's own pipeline (Optimus), p2p
exchanges, collectives, per-action costs and the simulator."""
