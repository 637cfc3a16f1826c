"""What the channel analysis knows about ops: op name (``channel_graph._op_name``: torch.fx's
function / method names and ATen's, without underscores) -> the rule that follows channels through
it (a ``ChannelGraph._h_<rule>`` method). An op not listed that reads channels keeps them (named in
the report); the rest of the model is still pruned.
"""

from __future__ import annotations

_ELEMENTWISE = """
add sub mul truediv div iadd isub imul itruediv neg abs pos relu relu6 gelu silu sigmoid tanh
hardswish hardsigmoid hardtanh leaky_relu elu selu celu mish softplus softsign tanhshrink
hardshrink softshrink logsigmoid glu_never dropout dropout1d dropout2d dropout3d alpha_dropout
feature_alpha_dropout feature_dropout clamp clip clamp_min clamp_max exp exp2 expm1 log log2 log10
log1p sqrt rsqrt pow square contiguous clone detach float half bfloat16 double to type_as alias
to_copy lift_fresh_copy rsub masked_fill maximum minimum where erf erfc sin cos tan sinh cosh
reciprocal sign floor ceil round trunc frac eq ne lt le gt ge and or xor logical_and logical_or
logical_not logical_xor bitwise_and bitwise_or bitwise_not bitwise_xor isnan isinf isfinite
nan_to_num lerp addcmul addcdiv floordiv floor_divide remainder fmod mod copy fill zero
stochastic_depth
"""
_SAME_RANK = """
max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d
adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d
lp_pool1d lp_pool2d interpolate upsample upsample_nearest1d upsample_nearest2d upsample_nearest3d
upsample_bilinear2d upsample_bicubic2d upsample_linear1d upsample_trilinear3d pad constant_pad_nd
reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d
replication_pad3d max_pool2d_with_indices max_pool3d_with_indices
"""
_RESHAPE = "view reshape flatten unflatten reshape_as view_as unsafe_view reshape_alias"
_MOVE = "transpose permute t movedim moveaxis swapaxes swapdims unsqueeze squeeze expand expand_as"
_SELECT = "select slice narrow"
_SPLIT = "split split_with_sizes chunk unbind unsafe_split unsafe_split_with_sizes unsafe_chunk"
_REDUCE = """
mean sum amax amin max min var std norm logsumexp prod argmax argmin all any nansum nanmean
var_mean std_mean count_nonzero linalg_vector_norm
"""
_MIX = "softmax log_softmax safe_softmax cumsum cumprod logcumsumexp flip roll sort cummax cummin"
_SIZE = """
size dim getattr numel shape ndimension sym_size sym_numel sym_stride assert_tensor_metadata
assert_scalar new_ones new_zeros new_full new_empty zeros_like ones_like full_like empty_like
rand_like randn_like arange
"""
_LAYER = "linear conv1d conv2d conv3d convolution addmm mm"
_NORM = "batch_norm layer_norm group_norm rms_norm"

HANDLERS: dict[str, str] = {}
for _names, _handler in (
    (_ELEMENTWISE, "elementwise"),
    (_SAME_RANK, "same_rank"),
    (_RESHAPE, "reshape"),
    (_MOVE, "move"),
    (_SELECT, "select"),
    (_SPLIT, "split"),
    (_REDUCE, "reduce"),
    (_MIX, "mix"),
    (_SIZE, "size"),
    (_LAYER, "layer"),
    (_NORM, "norm"),
    ("cat concat concatenate", "concat"),
    ("stack", "stack"),
    ("matmul bmm", "matmul"),
    ("scaled_dot_product_attention", "sdpa"),
    ("getitem", "getitem"),
    ("index", "index"),
    ("embedding", "embedding"),
):
    HANDLERS.update(dict.fromkeys(_names.split(), _handler))

#: ops that return a tuple whose first element carries the channels (values, indices / stats)
TUPLE_FIRST = {"max", "min", "sort", "var_mean", "std_mean", "cummax", "cummin",
               "max_pool2d_with_indices", "max_pool3d_with_indices"}  # fmt: skip

PASSTHROUGH_MODULES = set(
    """ReLU ReLU6 GELU SiLU Sigmoid Tanh Hardswish Hardsigmoid Hardtanh LeakyReLU ELU SELU CELU Mish
    Softplus Identity StochasticDepth Dropout Dropout1d Dropout2d Dropout3d AlphaDropout
    FeatureAlphaDropout""".split()
)
SPATIAL_MODULES = set(
    """MaxPool1d MaxPool2d MaxPool3d AvgPool1d AvgPool2d AvgPool3d AdaptiveAvgPool1d AdaptiveAvgPool2d
    AdaptiveAvgPool3d AdaptiveMaxPool1d AdaptiveMaxPool2d AdaptiveMaxPool3d Upsample
    UpsamplingNearest2d UpsamplingBilinear2d ZeroPad1d ZeroPad2d ZeroPad3d ConstantPad1d ConstantPad2d
    ConstantPad3d ReflectionPad1d ReflectionPad2d ReplicationPad1d ReplicationPad2d""".split()
)
#: modules whose dim argument mixes along it (softmax over the channels would change)
MIX_MODULES = {"Softmax": "dim", "LogSoftmax": "dim"}
