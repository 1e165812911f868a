"""What the tests share, one module a concern (tests/ is on ``sys.path``: ``from support import pace``).

- ``cluster_ranks``: ranks of the cluster tests as Ray tasks and actors (states, saves, restores, shard lookups).
- ``dcp_peers``: a folder standing in for peer memory in the DCP backend's tests.
- ``direct_port``: a shard's metadata for given bytes and a connection past a store port's hello.
- ``exact_states``: a bit-exact walk of a restored state against the saved one (leaf checks the caller's).
- ``fsdp_model``: a small FSDP2 model with Adam for the DTensor tests.
- ``gloo_ranks``: spawned rank processes of the DTensor tests (a gloo group, the work, a clean end).
- ``in_process_service``: the ray_ckpt service (registry and stores) in one process, without Ray.
- ``memory_states``: a dict standing in for peer memory in the trainer integrations' tests.
- ``pace``: this machine's speed, the unit of every test bound that depends on it.
- ``protocol_sim``: a deterministic pure-Python simulation of the whole commit protocol.
- ``ray_logs``: the lines about failures and recoveries from a cluster's Ray logs, for a failed test's report.
- ``recorded_events``: a realistic recorded events file and what a reader must find in it.
- ``save_pipelines``: one rank's ``SavePipeline`` for unit tests.
- ``scripts_under_test``: the scripts in scripts/ loaded as modules or run as programs.
- ``shard_metas``: shard metadata of one rank's step as the registry sees it (no bytes).
- ``sim_cluster``: the cluster tests' simulated cluster and the pool that shares it between a module's tests.
- ``trainer_runs``: peer memory that loses its process at a step, a guide's python blocks, bit-exact comparisons.
- ``warm_spares``: the idle, warmed-up worker processes in-place recovery keeps, by node.
"""
