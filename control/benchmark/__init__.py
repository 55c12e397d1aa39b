"""``synthbatch benchmark``: the sweep compiler, the analysis of its runs, the report."""
