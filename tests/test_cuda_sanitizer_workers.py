"""The GPU check's CUDA Sanitizer (one record for every worker thread) does
not report a cuDNN LSTM's metadata writes as races, and still reports a
real write on another stream.  Fed CSAN's handler the kernel launches as
CSAN's dispatch mode would (data pointers, aliases, the op's schema), which
needs no GPU; the first GPU check reported these two as races when two
workers ran one LSTM module on one GPU."""

import pytest
import torch

from fairseq_hybrid.harness.cuda_sanitizer_workers import SharedSanitizer, without_metadata_writes

WEIGHTS, OUTPUT = 1000, 2000
SET_ = torch.ops.aten.set_.source_Storage._schema
CUDNN_RNN = torch.ops.aten._cudnn_rnn.default._schema
ADD_ = torch.ops.aten.add_.Tensor._schema


def lstm_call(handler, stream):
    """What one nn.LSTM call on CUDA launches: try_get_weight_buf's set_
    over the weights' storage, then _cudnn_rnn returning that buffer."""
    errors = list(handler._handle_kernel_launch(stream, set(), {WEIGHTS}, {WEIGHTS}, SET_,
                                                {WEIGHTS: ["self", "output"]}))
    errors += handler._handle_kernel_launch(stream, set(), {WEIGHTS, OUTPUT + stream}, {WEIGHTS, OUTPUT + stream},
                                            CUDNN_RNN, {WEIGHTS: ["weight", "weight_buf", "output"],
                                                        OUTPUT + stream: ["output"]})
    return errors


@pytest.fixture
def sanitizer():
    try:
        return SharedSanitizer()
    except (RuntimeError, AttributeError) as error:  # a build without the GPU trace hooks
        pytest.skip(f"CSAN's handler cannot be built here: {error}")


def test_two_streams_reading_one_lstm_s_weights_are_not_a_race(sanitizer):
    assert lstm_call(sanitizer.handler, 1) == [] and lstm_call(sanitizer.handler, 2) == []
    assert sanitizer.errors == []


def test_csan_alone_reports_them(sanitizer):
    """Without the filter, CSAN's own handler reports the same two calls."""
    from torch.cuda._sanitizer import EventHandler

    plain = EventHandler()
    assert lstm_call(plain, 1) == [] and lstm_call(plain, 2) != []


def test_a_real_write_on_another_stream_is_still_a_race(sanitizer):
    handler = sanitizer.handler
    assert handler._handle_kernel_launch(1, set(), {WEIGHTS}, {WEIGHTS}, ADD_, {WEIGHTS: ["self", "output"]}) == []
    assert lstm_call(handler, 2) != []  # reads the weights stream 1 wrote, with no event between
    assert sanitizer.errors


def test_the_filter_changes_only_those_two_ops():
    launch = (1, {7}, {WEIGHTS}, {WEIGHTS}, ADD_, {WEIGHTS: ["weight"]})
    assert without_metadata_writes(*launch) == launch
    assert without_metadata_writes(1, set(), {WEIGHTS}, {WEIGHTS}, SET_, {WEIGHTS: ["self"]}) is None
    _, read_only, read_write, *_ = without_metadata_writes(1, set(), {WEIGHTS, OUTPUT}, {WEIGHTS, OUTPUT}, CUDNN_RNN,
                                                           {WEIGHTS: ["weight_buf"], OUTPUT: ["output"]})
    assert read_only == {WEIGHTS} and read_write == {OUTPUT}


def test_tensors_without_memory_are_not_recorded():
    """CSAN keys a tensor without elements by its Python id, which Python
    reuses: such tensors are left out (they touch no memory); the handler
    is CSAN's own again after the block."""
    from torch.cuda._sanitizer import ArgumentHandler

    from fairseq_hybrid.harness.cuda_sanitizer_workers import accesses_with_memory_only, has_memory

    assert not has_memory(torch.empty(0)) and has_memory(torch.zeros(2)) and has_memory(3)
    original = ArgumentHandler._handle_argument
    seen = []
    stand_in = ArgumentHandler._handle_argument = lambda self, value, *args, **kwargs: seen.append(value)
    try:
        with accesses_with_memory_only():
            handler = ArgumentHandler()
            empty, full = torch.empty(0), torch.ones(1)
            handler._handle_argument(empty, is_write=True, metadata_only=False)
            handler._handle_argument(full, is_write=True, metadata_only=False)
        assert seen == [full] and ArgumentHandler._handle_argument is stand_in
    finally:
        ArgumentHandler._handle_argument = original
