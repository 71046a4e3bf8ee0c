"""The router's side: the streams it consumes, the job state it applies, the channels it publishes
to, its leases, dead letters and shard counters.
"""
