"""test_tinker_wire.py — the gateway's protobuf messages (proto/tinker/
tinker_wire.proto) against the tinker SDK 0.38.0's own: every field of
every message the gateway reads or writes has the SDK's number, type,
label and oneof; a request the SDK encodes (dense and sparse tensors,
both config maps) decodes in the gateway to the same values; outputs the
gateway encodes decode in the SDK to the same values."""
import math

import numpy as np
import pytest
import torch

import tinker.proto.tinker_public_pb2 as sdk_pb
from tinker import types
from tinker.proto import request_conv, response_conv

from engined_client.tinker import wire
from engined_client._proto import tinker_wire_pb2 as ours

MESSAGES = ["ForwardBackwardRequest", "LossConfigValue", "Datum", "Chunk", "EncodedTextChunk",
            "ImageChunk", "ImageDimensions", "DmelChunk", "Tensor", "SparseCsr",
            "ProvenanceSpan", "PromptProvenanceSpan", "SampledProvenanceSpan",
            "ForwardBackwardOutput", "ArrayRecord", "BatchedTensor", "SampleResponse",
            "SampledSequence", "TopkLogprobs", "PromptAltTokens"]


def shape(fd):
    """What the wire depends on: number, type, repeated, the type's short
    name (a map's entry type too), the oneof (real ones only), presence."""
    t = fd.message_type.name if fd.message_type else fd.enum_type.name if fd.enum_type else ""
    oneof = fd.containing_oneof.name if (fd.containing_oneof and not
                                         fd.containing_oneof.name.startswith("_")) else ""
    repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
    return (fd.number, fd.type, repeated, t, oneof, fd.has_presence)


@pytest.mark.parametrize("name", MESSAGES)
def test_message_matches_the_sdk(name):
    a = ours.DESCRIPTOR.message_types_by_name[name]
    b = sdk_pb.DESCRIPTOR.message_types_by_name[name]
    assert {f.name: shape(f) for f in a.fields} == {f.name: shape(f) for f in b.fields}


def test_enums_match_the_sdk():
    for e in ("StopReason", "DType"):
        a = ours.DESCRIPTOR.enum_types_by_name[e]
        b = sdk_pb.DESCRIPTOR.enum_types_by_name[e]
        assert [(v.name, v.number) for v in a.values] == [(v.name, v.number) for v in b.values]


def test_sdk_request_decodes():
    rng = np.random.default_rng(0)
    w2 = torch.zeros(4, 3)
    w2[1, 2], w2[3, 0] = 0.5, -2.0  # a 2-D torch tensor: the SDK sends it sparse
    data = [types.Datum(model_input=types.ModelInput.from_ints([3, 4, 5]),
                        loss_fn_inputs={"target_tokens": [4, 5, 6],
                                        "weights": rng.normal(size=3).astype(np.float32)}),
            types.Datum(model_input=types.ModelInput(chunks=[
                types.EncodedTextChunk(tokens=[7, 8]), types.EncodedTextChunk(tokens=[9, 10])]),
                loss_fn_inputs={"target_tokens": [8, 9, 10, 11], "weights": w2})]
    req = types.ForwardBackwardRequest(
        model_id="s:train:0", seq_id=7,
        forward_backward_input=types.ForwardBackwardInput(
            data=data, loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.7,
                                                      "note": "x"}))
    raw = request_conv.forward_backward_request_to_proto(req).SerializeToString()
    fb = wire.parse_forward_backward(raw)
    assert (fb.model_id, fb.seq_id, fb.loss_fn, fb.forward_only) == ("s:train:0", 7, "ppo", False)
    assert fb.config == {"clip_low_threshold": 0.7, "note": "x"}
    assert fb.data[0].tokens.tolist() == [3, 4, 5]
    assert fb.data[1].tokens.tolist() == [7, 8, 9, 10]
    assert fb.data[0].inputs["target_tokens"].tolist() == [4, 5, 6]
    assert fb.data[0].inputs["target_tokens"].dtype == np.int64
    np.testing.assert_array_equal(fb.data[0].inputs["weights"], data[0].loss_fn_inputs[
        "weights"].to_numpy())
    np.testing.assert_array_equal(fb.data[1].inputs["weights"], w2.numpy())
    # The same content encodes to the same key; other content to another.
    assert wire.parse_forward_backward(raw).key() == fb.key()
    req.forward_backward_input.loss_fn_config["clip_low_threshold"] = 0.75
    raw2 = request_conv.forward_backward_request_to_proto(req).SerializeToString()
    assert wire.parse_forward_backward(raw2).key() != fb.key()


@pytest.mark.parametrize("body", [b"\xff\xff\xff", b"\x1a\x05\x0a\x03\x0a\x01"])
def test_malformed_body_is_a_user_error(body):
    with pytest.raises(wire.UserError, match="not a ForwardBackwardRequest|body"):
        wire.parse_forward_backward(body)


def test_outputs_decode_in_the_sdk():
    lps = [np.array([-1.5, -0.25, -3.0], np.float32), np.array([-0.5], np.float32)]
    out = response_conv.deserialize_forward_backward_output(
        wire.forward_backward_output(lps, {"loss:sum": 5.25, "num_tokens:sum": 4.0}))
    assert out.metrics == {"loss:sum": 5.25, "num_tokens:sum": 4.0}
    assert len(out.loss_fn_outputs) == 2
    for o, want in zip(out.loss_fn_outputs, lps):
        np.testing.assert_array_equal(o["logprobs"].to_numpy(), want)
    top_ids = np.array([[4, 9], [1, 2]], np.int32)
    top_lp = np.array([[-0.1, -2.5], [-0.3, -1.0]], np.float32)
    plp = np.array([math.nan, -2.0, -1.25], np.float32)
    s = response_conv.deserialize_sample_response(wire.sample_output(
        [("stop", [4, 1], [-0.1, -0.3], top_ids, top_lp), ("length", [7], [-4.0], None, None)],
        plp))
    assert [q.stop_reason for q in s.sequences] == ["stop", "length"]
    assert s.sequences[0].tokens == [4, 1] and s.sequences[1].tokens == [7]
    np.testing.assert_array_equal(np.array(s.sequences[0].logprobs, np.float32),
                                  np.array([-0.1, -0.3], np.float32))
    assert s.prompt_logprobs[0] is None and s.prompt_logprobs[1:] == [-2.0, -1.25]
