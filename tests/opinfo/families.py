"""Which family a sweep entry belongs to, which entries are random, and the CI subsets.

Torch-free: OpInfo entries are named by their entry key (`name` or
`name.variant_test_name`, see results.entry_key), ModuleInfo entries by
their name ("nn.Linear").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Entries whose values are random or uninitialised: flagos draws its own
# random numbers (docs/usage.md), so only shapes and dtypes are compared.
RANDOM_ENTRIES: frozenset[str] = frozenset(
    {
        "bernoulli",
        "cauchy",
        "exponential",
        "geometric",
        "log_normal",
        "multinomial",
        "normal",
        "normal.in_place",
        "normal.number_mean",
        "uniform",
        "rand_like",
        "randint",
        "randint_like",
        "randn",
        "randn_like",
        "nn.functional.dropout",
        "nn.functional.dropout2d",
        "nn.functional.dropout3d",
        "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.fractional_max_pool2d",
        "nn.functional.fractional_max_pool3d",
        "nn.functional.rrelu",
        "svd_lowrank",
        "pca_lowrank",
        # uninitialised memory
        "empty",
        "empty_like",
        "empty_permuted",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
    }
)


def is_random(entry: str) -> bool:
    return entry in RANDOM_ENTRIES


def is_random_sample(entry: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether this sample of a (mostly deterministic) entry draws random numbers: attention with dropout."""
    if entry in RANDOM_ENTRIES:
        return True
    if entry == "nn.functional.scaled_dot_product_attention":
        return bool(kwargs.get("dropout_p", 0.0))
    if entry == "nn.functional.multi_head_attention_forward":
        # multi_head_attention_forward(query, key, value, ..., add_zero_attn, dropout_p, ...): args start at key.
        return bool(kwargs.get("training", True)) and len(args) > 9 and bool(args[9])
    return False


# Sample arguments (by position in sample.args) that must stay on the CPU
# because the operator requires a CPU tensor there.
CPU_ARGS: dict[str, frozenset[int]] = {
    "tensor_split": frozenset({0}),  # tensor_indices_or_sections
}


# The CI subset (tests/opinfo/test_opinfo_subset.py), by family. Entries that
# fail because of a flagos bug stay here: the test is the bug's reminder.
SUBSET: dict[str, tuple[str, ...]] = {
    "elementwise unary": (
        "abs", "neg", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
        "erf", "erfinv", "floor", "round", "sign", "sgn", "reciprocal", "bitwise_not",
        "logical_not", "isnan", "nan_to_num", "frac", "lgamma", "angle", "conj_physical",
        "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "nn.functional.softplus",
        "special.i0e",
    ),
    "elementwise binary": (
        "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "remainder", "fmod",
        "pow", "atan2", "maximum", "minimum", "eq", "lt", "bitwise_and", "bitwise_left_shift",
        "logical_xor", "where", "clamp", "lerp", "addcmul", "addcdiv", "copysign", "hypot",
        "xlogy", "isclose", "__rsub__", "float_power",
    ),
    "reductions": (
        "sum", "mean", "prod", "amax", "argmin", "max.reduction_with_dim", "min.reduction_no_dim",
        "std", "var_mean", "logsumexp", "all", "any", "norm", "linalg.vector_norm", "nansum",
        "count_nonzero", "cumsum", "cumprod", "logcumsumexp", "aminmax", "median",
        "masked.sum", "softmax", "log_softmax",
    ),
    "linear algebra": (
        "mm", "bmm", "matmul", "addmm", "baddbmm", "mv", "dot", "vdot", "outer", "einsum",
        "tensordot", "linalg.inv", "linalg.det", "linalg.solve", "linalg.cholesky", "linalg.qr",
        "linalg.svd", "linalg.eigh", "linalg.lu_factor", "triangular_solve", "cross", "trace",
        "kron", "cdist",
    ),
    "indexing, scatter, gather": (
        "__getitem__", "index_select", "index_add", "index_copy", "index_fill", "index_put",
        "gather", "scatter", "scatter_add", "scatter_reduce.sum", "scatter_reduce.amax", "take",
        "take_along_dim", "put", "masked_fill", "masked_scatter", "masked_select", "nonzero",
        "argwhere", "index_reduce.prod",
    ),
    "shape": (
        "view", "reshape", "permute", "transpose", "t", "squeeze", "unsqueeze", "expand",
        "flatten", "unflatten", "cat", "stack", "split", "chunk", "narrow", "select", "slice",
        "flip", "roll", "rot90", "repeat", "tile", "tril", "triu", "diagonal", "diag_embed",
        "unfold", "movedim", "as_strided", "contiguous", "clone", "view_as_real", "view_as_complex",
        "nn.functional.pad.constant", "nn.functional.pad.reflect", "constant_pad_nd", "unbind",
        "meshgrid.list_of_tensors", "repeat_interleave", "broadcast_to",
    ),
    "convolution and pooling": (
        "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv_transpose2d",
        "nn.functional.max_pool2d", "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d",
        "nn.functional.adaptive_max_pool1d", "nn.functional.interpolate.bilinear",
        "nn.functional.interpolate.nearest", "nn.functional.unfold", "nn.functional.pixel_shuffle",
        "nn.functional.grid_sample", "nn.functional.embedding", "nn.functional.linear",
        "nn.functional.scaled_dot_product_attention", "nn.functional.avg_pool3d",
    ),
    "normalization": (
        "nn.functional.batch_norm", "nn.functional.layer_norm", "nn.functional.group_norm",
        "nn.functional.instance_norm", "nn.functional.rms_norm", "nn.functional.normalize",
        "nn.functional.local_response_norm", "native_layer_norm",
    ),
    "losses": (
        "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
        "nn.functional.l1_loss", "nn.functional.smooth_l1_loss", "nn.functional.huber_loss",
        "nn.functional.binary_cross_entropy", "nn.functional.binary_cross_entropy_with_logits",
        "nn.functional.kl_div", "nn.functional.margin_ranking_loss", "nn.functional.ctc_loss",
        "nn.functional.triplet_margin_loss", "nn.functional.multi_margin_loss",
    ),
    "random": (
        "bernoulli", "normal", "uniform", "multinomial", "randn_like", "randint",
        "nn.functional.dropout", "empty_like",
    ),
    "sorting and searching": (
        "sort", "argsort", "topk", "kthvalue", "msort", "unique", "unique_consecutive",
        "searchsorted", "bucketize", "mode", "histc",
    ),
    "factories": (
        "zeros", "ones", "full", "arange", "linspace", "eye", "zeros_like", "full_like",
        "new_ones", "tril_indices", "scalar_tensor",
    ),
    "foreach": (
        "_foreach_add", "_foreach_mul", "_foreach_exp", "_foreach_sqrt", "_foreach_addcmul",
        "_foreach_lerp", "_foreach_norm", "_foreach_maximum", "_foreach_zero",
    ),
    "dtype conversion": (
        "to", "float", "half", "bool", "long",
    ),
}


# The module sweep's CI subset (tests/opinfo/test_module_subset.py), by family;
# each runs its first MODULE_SUBSET_MAX_SAMPLES samples per (dtype, mode).
MODULE_SUBSET: dict[str, tuple[str, ...]] = {
    "linear and convolution": ("nn.Linear", "nn.Bilinear", "nn.Conv2d", "nn.ConvTranspose1d", "nn.LazyConv1d"),
    "pooling and padding": ("nn.MaxPool2d", "nn.AvgPool3d", "nn.AdaptiveAvgPool2d", "nn.FractionalMaxPool2d",
                            "nn.ReflectionPad2d", "nn.CircularPad1d"),
    "normalization": ("nn.BatchNorm2d", "nn.LayerNorm", "nn.GroupNorm", "nn.InstanceNorm1d", "nn.RMSNorm"),
    "activations": ("nn.GELU", "nn.PReLU", "nn.Softmax", "nn.Hardswish"),
    "losses": ("nn.CrossEntropyLoss", "nn.NLLLoss", "nn.CTCLoss", "nn.KLDivLoss", "nn.MultiMarginLoss"),
    "recurrent": ("nn.LSTM", "nn.GRUCell"),
    "attention and transformers": ("nn.MultiheadAttention", "nn.TransformerEncoderLayer"),
    "embedding": ("nn.Embedding",),
}
MODULE_SUBSET_MAX_SAMPLES = 2


def subset_entries(subset: dict[str, tuple[str, ...]] = SUBSET) -> list[str]:
    """A CI subset's entries, sorted, without duplicates."""
    return sorted({entry for entries in subset.values() for entry in entries})


def family_of(entry: str, subset: dict[str, tuple[str, ...]] = SUBSET) -> str | None:
    for family, entries in subset.items():
        if entry in entries:
            return family
    return None


# The CI subset of the mixed-operand sweep (tests/opinfo/test_mixed_subset.py):
# entries where meta functions and CPU kernels disagreed (now handled: where,
# addr, huber_loss, normal) and, by family, entries that take mixed operands.
MIXED_SUBSET: dict[str, tuple[str, ...]] = {
    "meta and kernel disagreed": ("where", "addr", "nn.functional.huber_loss", "normal"),
    "elementwise": ("add", "mul", "div.no_rounding_mode", "lerp", "addcmul", "clamp", "pow", "masked_fill"),
    "indexing": ("index_select", "gather", "index_put", "scatter_add", "take_along_dim"),
    "linear algebra": ("matmul", "addmm", "baddbmm"),
    "losses": ("nn.functional.mse_loss", "nn.functional.cross_entropy", "nn.functional.nll_loss"),
}
MIXED_SUBSET_MAX_SAMPLES = 4  # as scripts/mixed-sweep

