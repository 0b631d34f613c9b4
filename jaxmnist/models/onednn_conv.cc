// Stride-1 2-D convolution through oneDNN, as XLA FFI handlers for the CPU
// (jaxmnist/models/onednn.py builds, loads and calls this file).
//
// Activations are NHWC and weights HWIO, as everywhere in jaxmnist.models.conv.
// oneDNN reads and writes the activations in place; the weights go into the
// layout its kernel prefers (and the weight gradient comes back out of it) by
// a reorder. Dimensions before the last four are vmap's: each handler loops
// over them, broadcasting an operand whose size there is 1
// (vmap_method="expand_dims").
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using dnnl::memory;
using Tag = dnnl::memory::format_tag;

namespace {

enum Kind { kForward = 0, kBackwardData = 1, kBackwardWeights = 2 };

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One convolution: x (n, h, w, c), weights (k, k, c, o), zero padding `pad`.
struct Shape {
  int64_t n, h, w, c, k, o, pad;
  memory::data_type dtype;
  int64_t ho() const { return h + 2 * pad - k + 1; }
  int64_t wo() const { return w + 2 * pad - k + 1; }
  memory::desc src() const { return {{n, c, h, w}, dtype, Tag::nhwc}; }
  memory::desc weights(Tag tag) const { return {{o, c, k, k}, dtype, tag}; }
  memory::desc dst() const { return {{n, o, ho(), wo()}, dtype, Tag::nhwc}; }
  std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int> key() const {
    return {n, h, w, c, k, o, pad, static_cast<int>(dtype)};
  }
};

// A primitive for one shape, and the reorder between HWIO weights and its layout.
struct Plan {
  std::mutex mu;  // one execution at a time: the primitive owns its scratchpad
  dnnl::primitive primitive;
  memory::desc weights_desc;
  bool plain_weights = true;
  dnnl::reorder reorder;
};

dnnl::convolution_forward::primitive_desc ForwardDesc(const Shape& s) {
  return {Engine(), dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
          s.src(),  s.weights(Tag::any),               s.dst(),
          {1, 1},   {s.pad, s.pad},                    {s.pad, s.pad}};
}

void SetWeights(Plan& plan, const Shape& s, const memory::desc& desc, bool out) {
  plan.weights_desc = desc;
  memory::desc hwio = s.weights(Tag::hwio);
  plan.plain_weights = desc == hwio;
  if (!plan.plain_weights) {
    plan.reorder = out ? dnnl::reorder({Engine(), desc, Engine(), hwio})
                       : dnnl::reorder({Engine(), hwio, Engine(), desc});
  }
}

void Build(Plan& plan, Kind kind, const Shape& s) {
  memory::dims strides{1, 1}, pad{s.pad, s.pad};
  auto algorithm = dnnl::algorithm::convolution_direct;
  if (kind == kForward) {
    auto pd = ForwardDesc(s);
    plan.primitive = dnnl::convolution_forward(pd);
    SetWeights(plan, s, pd.weights_desc(), false);
  } else if (kind == kBackwardData) {
    dnnl::convolution_backward_data::primitive_desc pd(Engine(), algorithm, s.src(),
                                                       s.weights(Tag::any), s.dst(), strides,
                                                       pad, pad, ForwardDesc(s));
    plan.primitive = dnnl::convolution_backward_data(pd);
    SetWeights(plan, s, pd.weights_desc(), false);
  } else {
    dnnl::convolution_backward_weights::primitive_desc pd(Engine(), algorithm, s.src(),
                                                          s.weights(Tag::any), s.dst(),
                                                          strides, pad, pad, ForwardDesc(s));
    plan.primitive = dnnl::convolution_backward_weights(pd);
    SetWeights(plan, s, pd.diff_weights_desc(), true);
  }
}

Plan& GetPlan(Kind kind, const Shape& s) {
  static std::mutex mu;
  static std::map<std::pair<int, decltype(s.key())>, std::unique_ptr<Plan>> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = plans[{kind, s.key()}];
  if (!slot) {
    auto plan = std::make_unique<Plan>();
    Build(*plan, kind, s);  // throws dnnl::error, leaving nothing cached
    slot = std::move(plan);
  }
  return *slot;
}

// One convolution on raw pointers: `a`, `b` and `out` are the handler's buffers
// (forward: x, w -> y; backward data: g, w -> dx; backward weights: x, g -> dw).
void Run(Plan& plan, Kind kind, const Shape& s, void* a, void* b, void* out) {
  std::lock_guard<std::mutex> lock(plan.mu);
  dnnl::stream stream(Engine());
  if (kind == kBackwardWeights) {
    memory src(s.src(), Engine(), a), diff_dst(s.dst(), Engine(), b);
    memory hwio(s.weights(Tag::hwio), Engine(), out);
    memory diff_weights = plan.plain_weights ? hwio : memory(plan.weights_desc, Engine());
    plan.primitive.execute(stream, {{DNNL_ARG_SRC, src},
                                    {DNNL_ARG_DIFF_DST, diff_dst},
                                    {DNNL_ARG_DIFF_WEIGHTS, diff_weights}});
    if (!plan.plain_weights) plan.reorder.execute(stream, diff_weights, hwio);
  } else {
    memory hwio(s.weights(Tag::hwio), Engine(), b);
    memory weights = plan.plain_weights ? hwio : memory(plan.weights_desc, Engine());
    if (!plan.plain_weights) plan.reorder.execute(stream, hwio, weights);
    if (kind == kForward) {
      memory src(s.src(), Engine(), a), dst(s.dst(), Engine(), out);
      plan.primitive.execute(
          stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
    } else {
      memory diff_dst(s.dst(), Engine(), a), diff_src(s.src(), Engine(), out);
      plan.primitive.execute(stream, {{DNNL_ARG_DIFF_DST, diff_dst},
                                      {DNNL_ARG_WEIGHTS, weights},
                                      {DNNL_ARG_DIFF_SRC, diff_src}});
    }
  }
  stream.wait();
}

// The last four dimensions of a buffer, and the vmap dimensions before them.
struct Split {
  std::vector<int64_t> lead;
  int64_t d[4];
  int64_t inner() const { return d[0] * d[1] * d[2] * d[3]; }
};

Split SplitDims(ffi::Span<const int64_t> dims) {
  Split s;
  size_t r = dims.size();
  s.lead.assign(dims.begin(), dims.begin() + (r - 4));
  for (int i = 0; i < 4; ++i) s.d[i] = dims[r - 4 + i];
  return s;
}

ffi::Error Handle(Kind kind, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer out,
                  int64_t pad) {
  ffi::DataType type = a.element_type();
  if (b.element_type() != type || out.element_type() != type ||
      (type != ffi::DataType::F32 && type != ffi::DataType::BF16)) {
    return ffi::Error::InvalidArgument("onednn conv: float32 or bfloat16 operands of one dtype");
  }
  if (a.dimensions().size() < 4 || a.dimensions().size() != b.dimensions().size() ||
      a.dimensions().size() != out.dimensions().size()) {
    return ffi::Error::InvalidArgument("onednn conv: operands of one rank >= 4");
  }
  Split sa = SplitDims(a.dimensions()), sb = SplitDims(b.dimensions());
  Split so = SplitDims(out.dimensions());
  // x (n, h, w, c) and weights (k, k, c, o), wherever each comes from.
  const Split& x = kind == kBackwardData ? so : sa;
  const Split& w = kind == kForward ? sb : kind == kBackwardData ? sb : so;
  Shape s{x.d[0], x.d[1], x.d[2], x.d[3], w.d[0], w.d[3], pad,
          type == ffi::DataType::BF16 ? memory::data_type::bf16 : memory::data_type::f32};
  size_t bytes = type == ffi::DataType::BF16 ? 2 : 4;
  // Row-major strides over the vmap dimensions; 0 where an operand broadcasts.
  size_t rank = so.lead.size();
  std::vector<int64_t> stride_a(rank), stride_b(rank);
  int64_t count = 1, na = 1, nb = 1;
  for (size_t i = rank; i-- > 0;) {
    for (auto [lead, stride, n] : {std::tuple{&sa.lead, &stride_a, &na},
                                   std::tuple{&sb.lead, &stride_b, &nb}}) {
      int64_t size = (*lead)[i];
      if (size != 1 && size != so.lead[i]) {
        return ffi::Error::InvalidArgument("onednn conv: vmap dimensions do not broadcast");
      }
      (*stride)[i] = size == 1 ? 0 : *n;
      *n *= size;
    }
    count *= so.lead[i];
  }
  try {
    Plan& plan = GetPlan(kind, s);
    auto* pa = static_cast<char*>(a.untyped_data());
    auto* pb = static_cast<char*>(b.untyped_data());
    auto* po = static_cast<char*>(out.untyped_data());
    for (int64_t flat = 0; flat < count; ++flat) {
      int64_t ia = 0, ib = 0, rest = flat;
      for (size_t i = rank; i-- > 0;) {
        int64_t index = rest % so.lead[i];
        rest /= so.lead[i];
        ia += index * stride_a[i];
        ib += index * stride_b[i];
      }
      Run(plan, kind, s, pa + ia * sa.inner() * bytes, pb + ib * sb.inner() * bytes,
          po + flat * so.inner() * bytes);
    }
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string("onednn conv: ") + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> y,
                   int64_t pad) {
  return Handle(kForward, x, w, *y, pad);
}

ffi::Error BackwardData(ffi::AnyBuffer g, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> dx,
                        int64_t pad) {
  return Handle(kBackwardData, g, w, *dx, pad);
}

ffi::Error BackwardWeights(ffi::AnyBuffer x, ffi::AnyBuffer g, ffi::Result<ffi::AnyBuffer> dw,
                           int64_t pad) {
  return Handle(kBackwardWeights, x, g, *dw, pad);
}

auto Binding() {
  return ffi::Ffi::Bind()
      .Arg<ffi::AnyBuffer>()
      .Arg<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>()
      .Attr<int64_t>("pad");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmnistOnednnConvForward, Forward, Binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmnistOnednnConvBackwardData, BackwardData, Binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmnistOnednnConvBackwardWeights, BackwardWeights, Binding());
