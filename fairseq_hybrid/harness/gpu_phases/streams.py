"""The GPU check's streams phase: a group's steps under PyTorch's CUDA Sanitizer
on every worker, and a step with no host wait for the devices (docs/gpu.md)."""

from .base import devices_for


def phase_streams(args, result):
    import torch

    if args.device != "cuda":
        result.update(ok=True, skipped="needs CUDA (the virtual streams check the same lines on CPU in the tests)")
        return
    from fairseq_hybrid.harness.cuda_sanitizer_workers import SharedSanitizer
    from fairseq_hybrid.harness.exactness import check_equal
    from fairseq_hybrid.harness.stand_ins import make_dictionary

    count = torch.cuda.device_count()
    dictionaries = (make_dictionary(), make_dictionary(37))
    sanitizer, runs = SharedSanitizer(), []
    with sanitizer.enabled():
        for k in (int(x) for x in args.groups.split(",")):
            devices = devices_for("cuda", count, k)
            for mode, micro_batches in (("hybrid", 1), ("hybrid", 3), ("model", 1), ("data", 1)):
                before = len(sanitizer.errors)
                entry = {"devices": ",".join(devices), "mode": mode, "micro_batches": micro_batches}
                try:
                    check_equal(devices, mode, dictionaries, batch_on_first_device=True, hybrid_chunk_length=3,
                                group_options={"hybrid_micro_batches": micro_batches})
                    entry["ok"] = True
                except Exception as error:  # a race (CUDASanitizerErrors) or a wrong result
                    entry.update(ok=False, error=str(error)[-1500:])
                entry["races"] = sanitizer.errors[before:][:5]
                runs.append(entry)
                print(entry, flush=True)
    waits = [step_without_waits(devices_for("cuda", count, int(k))) for k in args.groups.split(",")]
    for entry in waits:
        print(entry, flush=True)
    result.update(ok=all(run["ok"] and not run["races"] for run in runs) and all(run["ok"] for run in waits),
                  runs=runs, races=len(sanitizer.errors), no_waits=waits)


def step_without_waits(devices):
    """One group step after a warm-up under ``set_sync_debug_mode("error")``
    (process-wide: the workers' cells too), which raises on any op that makes
    the host wait for a GPU; the batch kept on the host as fairseq's is."""
    import torch

    from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
    from fairseq_hybrid.harness.measuring import on_device
    from fairseq_hybrid.harness.stand_ins import StandInTask, build_model, make_dictionary, make_sample
    from fairseq_hybrid.parallel.runtime.host_batch import keep_on_host

    src_dict, tgt_dict = make_dictionary(), make_dictionary(37)
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, hybrid_devices=",".join(devices),
                        hybrid_chunk_length=3)
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    entry = {"devices": ",".join(devices), "mode": "hybrid"}
    for checked in (False, True):
        sample = keep_on_host(make_sample(src_dict, tgt_dict, [7, 5, 3, 6], [4, 6, 2, 5]), devices,
                              lambda host: on_device(host, devices[0]))
        torch.cuda.set_sync_debug_mode("error" if checked else 0)
        try:
            loss, _, _ = criterion(model, sample)
            loss.backward()
        except Exception as error:  # the op that waited, raised in a cell or on this thread
            entry.update(ok=False, error=f"{type(error).__name__}: {str(error)[-1500:]}")
            return entry
        finally:
            torch.cuda.set_sync_debug_mode(0)
        model.zero_grad()
    entry["ok"] = True
    return entry
