"""meter: what a cluster has cost, from stored node and job events (the ledger's arithmetic)."""
