"""The dataset recipe's rules, shared by plan-time validation and the generator.

A recipe is the built-in client's column model (``docs/generator.md``): templates with
``{column}`` / ``{column.field}`` placeholders (:mod:`.template`), the column kinds and
the dependency graph they form (:mod:`.columns`), the JSON-schema subset of structured
columns (:mod:`.schema`) and the seed-data formats (:mod:`.seeds`). The control plane
checks a run with these modules at plan time and the ``generate`` role runs it with the
same ones, so a rule has one home. Standard library only.
"""
