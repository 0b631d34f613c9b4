// Stride-1 2-D convolution and the max-pooling after it through oneDNN, as XLA
// FFI handlers for the CPU (jaxmnist/models/onednn.py registers and calls them;
// module.cc hands them to Python); the pooling also with a block's bias and ReLU
// applied as it writes (post-ops), in training and in inference.
//
// Activations are NHWC and weights HWIO, as everywhere in jaxmnist.models.conv.
// oneDNN reads and writes the activations in place; the weights go into the
// layout its kernel prefers (and the weight gradient comes back out of it) by
// a reorder. Dimensions before the last four are vmap's: each handler loops
// over them, broadcasting an operand whose size there is 1
// (vmap_method="expand_dims").
//
// Every primitive here runs with a scratchpad it owns (scratchpad_mode::user,
// one buffer per plan). oneDNN's default, the library-managed "global"
// scratchpad that some implementations use (the gemm-based weight gradient
// among them), is a thread_local buffer sized when the primitive is created,
// on the creating thread; a cached plan executed later on another of XLA's
// threads reads that thread's buffer instead, which may be absent or smaller:
// writes through a null or short buffer (segfaults, a corrupted heap, possibly
// wrong numbers), for kernels large enough that oneDNN picks the gemm weight
// gradient with its large im2col scratchpad. The plan's mutex makes its own
// buffer safe to reuse; the cost is one buffer per plan instead of one shared.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
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

// A primitive for one shape, the reorder between HWIO weights and its layout
// (a convolution's; a pooling has no weights), and the scratchpads of both (see
// the top of this file for why they are ours).
struct Plan {
  std::mutex mu;  // one execution at a time: the scratchpads are the plan's
  dnnl::primitive primitive;
  memory scratchpad;
  memory::desc weights_desc;
  bool plain_weights = true;
  dnnl::reorder reorder;
  memory reorder_scratchpad;
};

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

dnnl::convolution_forward::primitive_desc ForwardDesc(const Shape& s) {
  return {Engine(), dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
          s.src(),  s.weights(Tag::any),               s.dst(),
          {1, 1},   {s.pad, s.pad},                    {s.pad, s.pad},
          UserScratchpad()};
}

void SetWeights(Plan& plan, const Shape& s, const memory::desc& desc, bool out) {
  plan.weights_desc = desc;
  memory::desc hwio = s.weights(Tag::hwio);
  plan.plain_weights = desc == hwio;
  if (!plan.plain_weights) {
    dnnl::reorder::primitive_desc pd =
        out ? dnnl::reorder::primitive_desc(Engine(), desc, Engine(), hwio, UserScratchpad())
            : dnnl::reorder::primitive_desc(Engine(), hwio, Engine(), desc, UserScratchpad());
    plan.reorder = dnnl::reorder(pd);
    plan.reorder_scratchpad = memory(pd.scratchpad_desc(), Engine());
  }
}

void SetPrimitive(Plan& plan, dnnl::primitive primitive, const memory::desc& scratchpad) {
  plan.primitive = std::move(primitive);
  plan.scratchpad = memory(scratchpad, Engine());
}

void Build(Plan& plan, Kind kind, const Shape& s) {
  memory::dims strides{1, 1}, pad{s.pad, s.pad};
  auto algorithm = dnnl::algorithm::convolution_direct;
  if (kind == kForward) {
    auto pd = ForwardDesc(s);
    SetPrimitive(plan, dnnl::convolution_forward(pd), pd.scratchpad_desc());
    SetWeights(plan, s, pd.weights_desc(), false);
  } else if (kind == kBackwardData) {
    dnnl::convolution_backward_data::primitive_desc pd(
        Engine(), algorithm, s.src(), s.weights(Tag::any), s.dst(), strides, pad, pad,
        ForwardDesc(s), UserScratchpad());
    SetPrimitive(plan, dnnl::convolution_backward_data(pd), pd.scratchpad_desc());
    SetWeights(plan, s, pd.weights_desc(), false);
  } else {
    dnnl::convolution_backward_weights::primitive_desc pd(
        Engine(), algorithm, s.src(), s.weights(Tag::any), s.dst(), strides, pad, pad,
        ForwardDesc(s), UserScratchpad());
    SetPrimitive(plan, dnnl::convolution_backward_weights(pd), pd.scratchpad_desc());
    SetWeights(plan, s, pd.diff_weights_desc(), true);
  }
}

// The plan cached for `key`, made by `build` on first use (one cache per call site:
// `build`'s type is its own); a build that throws dnnl::error leaves nothing cached.
template <typename Key, typename Build>
Plan& Cached(const Key& key, Build build) {
  static std::mutex mu;
  static std::map<Key, std::unique_ptr<Plan>> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = plans[key];
  if (!slot) {
    auto plan = std::make_unique<Plan>();
    build(*plan);
    slot = std::move(plan);
  }
  return *slot;
}

Plan& GetPlan(Kind kind, const Shape& s) {
  return Cached(std::pair{kind, s.key()}, [&](Plan& plan) { Build(plan, kind, s); });
}

// One convolution on raw pointers: `a`, `b` and `out` are the handler's buffers
// (forward: x, w -> y; backward data: g, w -> dx; backward weights: x, g -> dw).
void Run(Plan& plan, Kind kind, const Shape& s, void* a, void* b, void* out) {
  std::lock_guard<std::mutex> lock(plan.mu);
  dnnl::stream stream(Engine());
  auto reorder = [&](const memory& from, const memory& to) {
    plan.reorder.execute(stream, {{DNNL_ARG_FROM, from},
                                  {DNNL_ARG_TO, to},
                                  {DNNL_ARG_SCRATCHPAD, plan.reorder_scratchpad}});
  };
  if (kind == kBackwardWeights) {
    memory src(s.src(), Engine(), a), diff_dst(s.dst(), Engine(), b);
    memory hwio(s.weights(Tag::hwio), Engine(), out);
    memory diff_weights = plan.plain_weights ? hwio : memory(plan.weights_desc, Engine());
    plan.primitive.execute(stream, {{DNNL_ARG_SRC, src},
                                    {DNNL_ARG_DIFF_DST, diff_dst},
                                    {DNNL_ARG_DIFF_WEIGHTS, diff_weights},
                                    {DNNL_ARG_SCRATCHPAD, plan.scratchpad}});
    if (!plan.plain_weights) reorder(diff_weights, hwio);
  } else {
    memory hwio(s.weights(Tag::hwio), Engine(), b);
    memory weights = plan.plain_weights ? hwio : memory(plan.weights_desc, Engine());
    if (!plan.plain_weights) reorder(hwio, weights);
    if (kind == kForward) {
      memory src(s.src(), Engine(), a), dst(s.dst(), Engine(), out);
      plan.primitive.execute(stream, {{DNNL_ARG_SRC, src},
                                      {DNNL_ARG_WEIGHTS, weights},
                                      {DNNL_ARG_DST, dst},
                                      {DNNL_ARG_SCRATCHPAD, plan.scratchpad}});
    } else {
      memory diff_dst(s.dst(), Engine(), a), diff_src(s.src(), Engine(), out);
      plan.primitive.execute(stream, {{DNNL_ARG_DIFF_DST, diff_dst},
                                      {DNNL_ARG_WEIGHTS, weights},
                                      {DNNL_ARG_DIFF_SRC, diff_src},
                                      {DNNL_ARG_SCRATCHPAD, plan.scratchpad}});
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

// A bias (c) as a (1, 1, 1, c) map under the same vmap dimensions as the maps.
Split BiasDims(ffi::Span<const int64_t> dims) {
  Split s;
  s.lead.assign(dims.begin(), dims.end() - 1);
  s.d[0] = s.d[1] = s.d[2] = 1;
  s.d[3] = dims.back();
  return s;
}

// Where each operand's slice lies at each vmap position of a result: row-major
// strides over the result's vmap dimensions, 0 where an operand broadcasts
// (its size there is 1). `ok` is false where an operand's do not broadcast.
struct VmapLoop {
  std::vector<int64_t> lead;
  std::vector<std::vector<int64_t>> strides;  // one per operand
  int64_t count = 1;
  bool ok = true;

  VmapLoop(std::initializer_list<const Split*> operands, const Split& result)
      : lead(result.lead) {
    for (int64_t d : lead) count *= d;
    for (const Split* operand : operands) {
      std::vector<int64_t> stride(lead.size());
      ok = ok && operand->lead.size() == lead.size();
      for (size_t i = lead.size(), n = 1; ok && i-- > 0;) {
        int64_t size = operand->lead[i];
        ok = size == 1 || size == lead[i];
        stride[i] = size == 1 ? 0 : n;
        n *= size;
      }
      strides.push_back(std::move(stride));
    }
  }

  // The slice of operand `k` at position `flat` of the result.
  int64_t Slice(size_t k, int64_t flat) const {
    int64_t index = 0;
    for (size_t i = lead.size(); i-- > 0;) {
      index += flat % lead[i] * strides[k][i];
      flat /= lead[i];
    }
    return index;
  }
};

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
  const Split& y = kind == kForward ? so : kind == kBackwardData ? sa : sb;
  Shape s{x.d[0], x.d[1], x.d[2], x.d[3], w.d[0], w.d[3], pad,
          type == ffi::DataType::BF16 ? memory::data_type::bf16 : memory::data_type::f32};
  // oneDNN trusts the descriptors: a shape that disagrees with them would have it
  // read or write outside XLA's buffers, so any mismatch is refused here.
  if (w.d[1] != s.k || w.d[2] != s.c || s.k < 1 || pad < 0 || 2 * pad > s.k - 1 ||
      s.ho() < 1 || s.wo() < 1 || y.d[0] != s.n || y.d[1] != s.ho() || y.d[2] != s.wo() ||
      y.d[3] != s.o) {
    return ffi::Error::InvalidArgument("onednn conv: operand shapes do not agree");
  }
  size_t bytes = type == ffi::DataType::BF16 ? 2 : 4;
  VmapLoop loop({&sa, &sb}, so);
  if (!loop.ok) {
    return ffi::Error::InvalidArgument("onednn conv: vmap dimensions do not broadcast");
  }
  if (sa.inner() == 0 || sb.inner() == 0) {  // an empty batch or channel: sums of nothing
    std::memset(out.untyped_data(), 0, out.size_bytes());
    return ffi::Error::Success();
  }
  try {
    Plan& plan = GetPlan(kind, s);
    auto* pa = static_cast<char*>(a.untyped_data());
    auto* pb = static_cast<char*>(b.untyped_data());
    auto* po = static_cast<char*>(out.untyped_data());
    for (int64_t i = 0; i < loop.count; ++i) {
      Run(plan, kind, s, pa + loop.Slice(0, i) * sa.inner() * bytes,
          pb + loop.Slice(1, i) * sb.inner() * bytes, po + i * so.inner() * bytes);
    }
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string("onednn conv: ") + e.what());
  }
  return ffi::Error::Success();
}

// Max-pooling over non-overlapping size x size windows, odd edges dropped:
// y (n, h, w, c) -> (n, h / size, w / size, c), NHWC. The forward pass also
// writes oneDNN's workspace, one byte per output naming which element of its
// window was the maximum; the backward pass sends each output's gradient there
// (and zero everywhere else). The byte layout is the library's: the handlers
// refuse to run if this oneDNN describes its workspace otherwise.
struct PoolShape {
  int64_t n, h, w, c, size;
  memory::data_type dtype;
  memory::dims window() const { return {size, size}; }
  // Negative where an odd edge is dropped: oneDNN's way of saying floor.
  memory::dims pad_r() const { return {h / size * size - h, w / size * size - w}; }
  memory::desc src() const { return {{n, c, h, w}, dtype, Tag::nhwc}; }
  memory::desc dst() const { return {{n, c, h / size, w / size}, dtype, Tag::nhwc}; }
  memory::desc workspace() const {
    return {{n, c, h / size, w / size}, memory::data_type::u8, Tag::nhwc};
  }
  memory::desc bias() const { return {{1, c, 1, 1}, dtype, Tag::nhwc}; }
  std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int> key() const {
    return {n, h, w, c, size, static_cast<int>(dtype)};
  }
};

dnnl::pooling_forward::primitive_desc PoolForwardDesc(
    const PoolShape& s, dnnl::prop_kind kind = dnnl::prop_kind::forward_training,
    dnnl::primitive_attr attr = UserScratchpad()) {
  return {Engine(), kind,     dnnl::algorithm::pooling_max,
          s.src(),  s.dst(),  s.window(), s.window(), {0, 0}, {0, 0}, s.pad_r(),
          attr};
}

// What a pooling plan computes: the forward pass of training (with the workspace),
// its backward pass, or relu(max + bias), in training (with the workspace) or in
// inference (without): the bias and the ReLU are post-ops, applied to each output
// as the kernel writes it.
enum PoolKind { kPoolForward = 0, kPoolBackward = 1, kPoolBiasRelu = 2, kPoolBiasReluTraining = 3 };

Plan& GetPoolPlan(PoolKind kind, const PoolShape& s) {
  return Cached(std::pair{static_cast<int>(kind), s.key()}, [&](Plan& plan) {
    dnnl::primitive_attr attr = UserScratchpad();
    if (kind == kPoolBiasRelu || kind == kPoolBiasReluTraining) {
      dnnl::post_ops ops;
      ops.append_binary(dnnl::algorithm::binary_add, s.bias());
      ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.f, 0.f);
      attr.set_post_ops(ops);
    }
    if (kind == kPoolBiasRelu) {
      auto pd = PoolForwardDesc(s, dnnl::prop_kind::forward_inference, attr);
      SetPrimitive(plan, dnnl::pooling_forward(pd), pd.scratchpad_desc());
      return;
    }
    auto forward = PoolForwardDesc(s, dnnl::prop_kind::forward_training, attr);
    if (forward.workspace_desc() != s.workspace()) {
      throw dnnl::error(dnnl_unimplemented, "max-pooling workspace is not one byte per output");
    }
    if (kind == kPoolBackward) {
      dnnl::pooling_backward::primitive_desc pd(
          Engine(), dnnl::algorithm::pooling_max, s.src(), s.dst(), s.window(), s.window(),
          {0, 0}, {0, 0}, s.pad_r(), PoolForwardDesc(s), UserScratchpad());
      SetPrimitive(plan, dnnl::pooling_backward(pd), pd.scratchpad_desc());
    } else {
      SetPrimitive(plan, dnnl::pooling_forward(forward), forward.scratchpad_desc());
    }
  });
}

memory::data_type DnnlType(ffi::DataType type) {
  return type == ffi::DataType::BF16 ? memory::data_type::bf16 : memory::data_type::f32;
}

bool SameDims(ffi::AnyBuffer a, ffi::AnyBuffer b) {
  auto da = a.dimensions(), db = b.dimensions();
  return da.size() == db.size() && std::equal(da.begin(), da.end(), db.begin());
}

// Forward: y -> pooled; with a bias (c) relu(pooled + bias), the order `cnn.apply`
// computes them in (both commute with the maximum, so this equals the activation
// pooled); in training (`ws` given) also the workspace, a byte per output.
ffi::Error HandlePoolForward(ffi::AnyBuffer y, ffi::AnyBuffer* bias, ffi::AnyBuffer out,
                             ffi::AnyBuffer* ws, int64_t size) {
  ffi::DataType type = y.element_type();
  if (out.element_type() != type || (bias != nullptr && bias->element_type() != type) ||
      (ws != nullptr && ws->element_type() != ffi::DataType::U8) ||
      (type != ffi::DataType::F32 && type != ffi::DataType::BF16)) {
    return ffi::Error::InvalidArgument(
        "onednn pool: float32 or bfloat16 values of one dtype, a uint8 workspace");
  }
  size_t rank = y.dimensions().size();
  if (rank < 4 || out.dimensions().size() != rank ||
      (bias != nullptr && bias->dimensions().size() != rank - 3)) {
    return ffi::Error::InvalidArgument("onednn pool: maps of one rank >= 4, a bias per channel");
  }
  Split sy = SplitDims(y.dimensions()), so = SplitDims(out.dimensions());
  Split sb;
  if (bias != nullptr) {
    sb = BiasDims(bias->dimensions());
  } else {
    sb.lead.assign(so.lead.size(), 1);  // none: broadcast everywhere, never read
  }
  PoolShape s{sy.d[0], sy.d[1], sy.d[2], sy.d[3], size, DnnlType(type)};
  if (size < 1 || s.h < size || s.w < size || so.d[0] != s.n || so.d[1] != s.h / size ||
      so.d[2] != s.w / size || so.d[3] != s.c || (bias != nullptr && sb.d[3] != s.c) ||
      (ws != nullptr && !SameDims(*ws, out))) {
    return ffi::Error::InvalidArgument("onednn pool: operand shapes do not agree");
  }
  VmapLoop loop({&sy, &sb}, so);
  if (!loop.ok) {
    return ffi::Error::InvalidArgument("onednn pool: vmap dimensions do not broadcast");
  }
  if (so.inner() == 0) return ffi::Error::Success();
  size_t bytes = type == ffi::DataType::BF16 ? 2 : 4;
  PoolKind kind = bias == nullptr ? kPoolForward
                  : ws == nullptr ? kPoolBiasRelu
                                  : kPoolBiasReluTraining;
  try {
    Plan& plan = GetPoolPlan(kind, s);
    std::lock_guard<std::mutex> lock(plan.mu);
    dnnl::stream stream(Engine());
    auto* py = static_cast<char*>(y.untyped_data());
    auto* po = static_cast<char*>(out.untyped_data());
    for (int64_t i = 0; i < loop.count; ++i) {
      std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, memory(s.src(), Engine(), py + loop.Slice(0, i) * sy.inner() * bytes)},
          {DNNL_ARG_DST, memory(s.dst(), Engine(), po + i * so.inner() * bytes)},
          {DNNL_ARG_SCRATCHPAD, plan.scratchpad}};
      if (bias != nullptr) {
        auto* pb = static_cast<char*>(bias->untyped_data()) + loop.Slice(1, i) * s.c * bytes;
        args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                     memory(s.bias(), Engine(), pb));
      }
      if (ws != nullptr) {
        auto* pw = static_cast<char*>(ws->untyped_data()) + i * so.inner();
        args.emplace(DNNL_ARG_WORKSPACE, memory(s.workspace(), Engine(), pw));
      }
      plan.primitive.execute(stream, args);
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string("onednn pool: ") + e.what());
  }
  return ffi::Error::Success();
}

// Backward: (g, workspace) -> dy.
ffi::Error PoolBackward(ffi::AnyBuffer g, ffi::AnyBuffer ws, ffi::Result<ffi::AnyBuffer> result,
                        int64_t size) {
  ffi::AnyBuffer dy = *result;
  ffi::DataType type = g.element_type();
  if (dy.element_type() != type || ws.element_type() != ffi::DataType::U8 ||
      (type != ffi::DataType::F32 && type != ffi::DataType::BF16)) {
    return ffi::Error::InvalidArgument(
        "onednn pool: float32 or bfloat16 values of one dtype, a uint8 workspace");
  }
  size_t rank = g.dimensions().size();
  if (rank < 4 || ws.dimensions().size() != rank || dy.dimensions().size() != rank) {
    return ffi::Error::InvalidArgument("onednn pool: operands of one rank >= 4");
  }
  Split sg = SplitDims(g.dimensions()), sw = SplitDims(ws.dimensions());
  Split sy = SplitDims(dy.dimensions());
  PoolShape s{sy.d[0], sy.d[1], sy.d[2], sy.d[3], size, DnnlType(type)};
  if (size < 1 || s.h < size || s.w < size || sg.d[0] != s.n || sg.d[1] != s.h / size ||
      sg.d[2] != s.w / size || sg.d[3] != s.c || std::memcmp(sw.d, sg.d, sizeof sg.d) != 0) {
    return ffi::Error::InvalidArgument("onednn pool: operand shapes do not agree");
  }
  VmapLoop loop({&sg, &sw}, sy);
  if (!loop.ok) {
    return ffi::Error::InvalidArgument("onednn pool: vmap dimensions do not broadcast");
  }
  if (sy.inner() == 0) return ffi::Error::Success();
  size_t bytes = type == ffi::DataType::BF16 ? 2 : 4;
  try {
    Plan& plan = GetPoolPlan(kPoolBackward, s);
    std::lock_guard<std::mutex> lock(plan.mu);
    dnnl::stream stream(Engine());
    auto* pg = static_cast<char*>(g.untyped_data());
    auto* pw = static_cast<char*>(ws.untyped_data());
    auto* py = static_cast<char*>(dy.untyped_data());
    for (int64_t i = 0; i < loop.count; ++i) {
      memory diff_dst(s.dst(), Engine(), pg + loop.Slice(0, i) * sg.inner() * bytes);
      memory workspace(s.workspace(), Engine(), pw + loop.Slice(1, i) * sg.inner());
      memory diff_src(s.src(), Engine(), py + i * sy.inner() * bytes);
      plan.primitive.execute(stream, {{DNNL_ARG_DIFF_DST, diff_dst},
                                      {DNNL_ARG_WORKSPACE, workspace},
                                      {DNNL_ARG_DIFF_SRC, diff_src},
                                      {DNNL_ARG_SCRATCHPAD, plan.scratchpad}});
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string("onednn pool: ") + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error PoolForward(ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> pooled,
                       ffi::Result<ffi::AnyBuffer> ws, int64_t size) {
  ffi::AnyBuffer workspace = *ws;
  return HandlePoolForward(y, nullptr, *pooled, &workspace, size);
}

ffi::Error PoolBiasRelu(ffi::AnyBuffer y, ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> out,
                        int64_t size) {
  return HandlePoolForward(y, &bias, *out, nullptr, size);
}

ffi::Error PoolBiasReluForward(ffi::AnyBuffer y, ffi::AnyBuffer bias,
                               ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> ws,
                               int64_t size) {
  ffi::AnyBuffer workspace = *ws;
  return HandlePoolForward(y, &bias, *out, &workspace, size);
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
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmnistOnednnPoolForward, PoolForward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("size"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmnistOnednnPoolBiasRelu, PoolBiasRelu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("size"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmnistOnednnPoolBiasReluForward, PoolBiasReluForward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("size"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmnistOnednnPoolBackward, PoolBackward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("size"));
