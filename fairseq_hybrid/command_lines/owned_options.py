"""The fairseq-train options the package's commands set themselves, in one
place: ``fairseq-hybrid-train`` refuses them from the user, and
``fairseq-hybrid-plan`` drops them from the user's command before it adds
its own (in the command it prints, and in each candidate ``--measure``
runs)."""

# the group's choices, which the plan makes for each candidate
GROUP_CHOICES = ("--hybrid-devices", "--hybrid-placement", "--hybrid-chunk-length", "--hybrid-micro-batches",
                 "--hybrid-softmax-chunks")
# one step's batch, which the plan keeps but says its own way
BATCH = ("--update-freq", "--max-tokens", "--batch-size")
# a rank's place in the job, which fairseq-hybrid-train gives every process it starts
RANKS = ("--distributed-world-size", "--distributed-rank", "--distributed-init-method", "--distributed-no-spawn",
         "--distributed-backend", "--ddp-backend", "--device-id", "--distributed-port")

SET_BY_TRAIN = RANKS + ("--hybrid-devices",)
SET_BY_PLAN = GROUP_CHOICES + BATCH + ("--distributed-world-size",)
# the batch is the user's, split by rows for DDP's ranks
SET_BY_MEASURE = GROUP_CHOICES + ("--distributed-world-size", "--cpu")
