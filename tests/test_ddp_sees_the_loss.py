"""Plain DDP (fairseq's ``--ddp-backend pytorch_ddp``, its default) with
``hybrid_cross_entropy``: PyTorch's DistributedDataParallel prepares its
gradient all-reduce in its forward, so a criterion that called a method of
the model past it (``model.loss_sums`` through fairseq's proxy) left every
rank with its own gradients, silently.  The criterion calls the model
itself, so the wrapper sees the step: after one backward pass on different
batches, both ranks hold the same, averaged gradients (gloo on CPU, as
fairseq wraps a model for ``pytorch_ddp``)."""

import datetime

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fairseq_hybrid.harness.stand_ins import StandInTask, build_model, make_dictionary, make_sample
from fairseq_hybrid.timing.ddp_rank import free_port


def rank_grads(rank: int, port: int, folder: str) -> None:
    from fairseq.distributed import ModuleProxyWrapper

    from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(minutes=2))
    src_dict, tgt_dict = make_dictionary(), make_dictionary(37)
    torch.manual_seed(1)
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, dropout=0.0)
    wrapped = ModuleProxyWrapper(torch.nn.parallel.DistributedDataParallel(model))
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    sample = make_sample(src_dict, tgt_dict, [5, 3, 7, 2], [4, 6, 2, 8], seed=2 + rank)  # each rank its own
    loss, _, _ = criterion(wrapped, sample)
    loss.backward()
    torch.save({name: p.grad for name, p in model.named_parameters()}, f"{folder}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def test_ddp_averages_the_gradients_of_hybrid_cross_entropy(tmp_path):
    mp.spawn(rank_grads, args=(free_port(), str(tmp_path)), nprocs=2)
    grads = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        assert torch.equal(grads[0][name], grads[1][name]), f"{name}: the ranks' gradients differ (not all-reduced)"
