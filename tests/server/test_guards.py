"""The checks gptpipe serve makes before running a signature (server/guards.py)."""

import pytest

from server.guards import Limits, check
from server.json_tensor import Tensor
from server.status import ServingError


def inputs(max_new_tokens=5, prompt=b"ROMEO:", name="prompt"):
    return {
        name: Tensor("DT_STRING", (1,), [prompt]),
        "max_new_tokens": Tensor("DT_INT32", (), [max_new_tokens]),
    }


def test_a_request_within_the_limits_passes():
    check(inputs(0), Limits(max_new_tokens=8))
    check(inputs(8), Limits(max_new_tokens=8))


@pytest.mark.parametrize("count", [-1, 9, 2**31 - 1])
@pytest.mark.bad_input("max_new_tokens below 0 or over the cap")
def test_max_new_tokens_outside_zero_to_the_cap_is_refused(count):
    with pytest.raises(ServingError) as caught:
        check(inputs(count), Limits(max_new_tokens=8))
    assert caught.value.http_status == 400
    assert caught.value.message.startswith(
        f"max_new_tokens is {count}: this server generates 0 to 8"
    )


@pytest.mark.bad_input("text that is not UTF-8 (b64 bytes)")
def test_text_that_is_not_utf8_is_refused_bytes_inputs_are_not_text():
    with pytest.raises(ServingError) as caught:
        check(inputs(prompt=b"ok \xff"), Limits())
    assert caught.value.http_status == 400
    assert (
        "input prompt: element 0 is not UTF-8 text (byte 0xff at offset 3)" in caught.value.message
    )
    check(inputs(prompt=b"\xff", name="image_bytes"), Limits())  # TF Serving's mark of binary
