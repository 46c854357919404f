"""Applications built on mpc3: the ``mpc3`` command line, the query user's translation flow,
local clusters and the benchmark harness. Imports point downward: app -> net -> protocols ->
mpc3."""
