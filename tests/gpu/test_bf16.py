"""bf16 against fp32 per block type: bf16 autocast and fp32 on the same weights, logits and every
parameter gradient as relative errors (tolerances in _common.BF16_TOL). On a CPU, torch's CPU bf16
kernels run."""

import pytest

from ._common import BLOCK_TYPES, build, compare, forward_backward, small_spec, token_ids

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("block", BLOCK_TYPES)
def test_bf16_against_fp32(block, env, rows):
    spec = small_spec(BLOCK_TYPES[block], env.device)
    model = build(spec, env.device)
    ids = token_ids(spec, env.device, 64 if env.rehearse else 1024, seed=1)
    ref = forward_backward(model, ids, bf16=False)
    compare(rows, block, forward_backward(model, ids, bf16=True), ref)
    rows.check()
