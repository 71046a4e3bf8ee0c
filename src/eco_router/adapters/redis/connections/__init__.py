"""Opening Redis connections for every topology and the machinery they share: Sentinel failover
watch, replica waits, pipelined round trips, Cluster slots, server processes.
"""
