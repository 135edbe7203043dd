"""One run on many processes: PyTorch's process group, FSDP2 sharding and the gathers that keep every arm exact.

World size 1 never reaches this package's machinery (`block_engines` hands the engines back and `TrainState.shard`
leaves the state as it is unless `train.sampling_shards` is set), so a one-process run keeps the plain code path
and its numbers bit for bit. Above it (`train.nproc_per_node=N`, torchrun, or SLURM tasks exporting RANK /
WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT), every rank runs the same loop (bench/train.py) on the same
config, and:

    models          policy and critic sharded with `fully_shard` per decoder layer plus the root (FSDP2, fp32
                    shards: the trainer's numerics are those of one process); gradients are summed, not averaged
    rollouts        the step's prompts are cut into `sampling_shards` contiguous blocks of whole prompt groups,
                    each sampled with its own generator seeded from the run's generator; rank r generates the
                    blocks b with b % N == r, and the blocks are all-gathered, so every rank holds the same batch
    rewards         computed by every rank on the gathered batch (cheap, and identical everywhere)
    log-probs       the micro-batches of bench.compute.micro_batches, rows sorted by length and dealt round-robin
                    to the ranks (each rank's part cut to its own rows' extent, padded to the same row count so
                    that every rank runs the same forwards); the [B, T] results are all-gathered: every arm's
                    `prepare` / `loss` sees the whole minibatch, unchanged
    backward        d loss / d logp is taken on the whole minibatch (as the micro-batched backward of
                    bench/compute.py does on one process), sliced to the rank's rows and pushed through its own
                    forward; FSDP2 sums the rows' gradients across ranks, which is the one-process gradient
    checkpoints     a torch.distributed.checkpoint (DCP) directory, every rank writing its own shards
                    (bench/checkpoint.py); only rank 0 writes the run directory and W&B (`FollowerRun`)

The rollout blocks are what makes a run independent of its world size: with `train.sampling_shards=S` set,
world sizes 1, 2, ..., S (dividing S or not) sample the same tokens and train the same numbers (up to the
summation order of the gradient norm and the weight-update diagnostics). With it unset, a multi-process run uses
one block per rank: changing the world size then reseeds the sampling streams (resume warns).

    group.py      the process group: joining, launching ranks, gathers, agreeing on a stop, leaving
    sharding.py   FSDP2: sharding a model, gathering it whole, loading whole states into shards, frozen copies
    compute.py    the trainer's passes and the critic's over a sharded model, each rank its rows
    engines.py    rollout and evaluation engines that sample in prompt blocks spread over the ranks
    follower.py   a rank > 0's view of the run directory (it writes nothing)
"""
