"""Status: the read model of a run's shards, the settled index, refresh and watch.

Kept free of imports: ``synthbatch status`` must start without pydantic (see
docs/observation.md and docs/architecture.md).
"""
