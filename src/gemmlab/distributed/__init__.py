"""Expert parallelism over ``torch.distributed``: each rank holds a contiguous slice of the experts.

moe_forward_ep(x, w1_local, w2_local, weights, ids, group=None, chunks=1)   the MoE body across ranks
expert_range(num_experts, group=None)   (first, end): the experts this rank holds
"""

from gemmlab.distributed.ep import expert_range, moe_forward_ep

__all__ = ["expert_range", "moe_forward_ep"]
