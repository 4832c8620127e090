// Scratch (session 52): CUTLASS 4.6's Hopper GEMM with a gated SiLU epilogue (examples/113,
// 113_hopper_gemm_fused_gated_act.cu) in BF16, as a C entry point for a Python lab (ctypes):
// h = silu(x · W_gᵀ) · (x · W_uᵀ) for the packed weight [W_g; W_u] (2I, K) row-major, x (N, K)
// row-major, h (N, I) row-major. The example's K-major gated stride maps the logical 8-gate/8-up
// row tiles onto the two halves of the packed weight. Six variants (NAMES below): the example's
// pingpong (128×128×64 tiles) and cooperative (128×256×64), cluster 1×2×1, and four more.
#include <cstdint>
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler_params.h"
#include "cutlass/util/packed_stride.hpp"
#include "gated_stride.hpp"
#include "gated_builder.hpp"

using namespace cute;

template <class T> using ActivationFn = cutlass::epilogue::thread::SiLu<T>;
using ProblemShape = Shape<int, int, int, int>;
using GatedProblemShape = decltype(cutlass::sm90_make_gated_shape<0>(ProblemShape{}));
using Element = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutC = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::ColumnMajor;
constexpr int Align = 128 / cutlass::sizeof_bits<Element>::value;
using Acc = float;
using EpiTile = cutlass::epilogue::collective::EpilogueTileAuto;

template <bool Pingpong, class TileShape, class ClusterShape>
struct Config {
  using KernelSchedule = conditional_t<Pingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                       cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = conditional_t<Pingpong, cutlass::epilogue::TmaWarpSpecialized,
                                         cutlass::epilogue::TmaWarpSpecializedCooperative>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::Sm90CollectiveBuilderGated<
      cutlass::arch::OpClassTensorOp, TileShape, ClusterShape, EpiTile, Acc, float, float, float,
      Element, LayoutC, Align, Element, LayoutD, Align, EpilogueSchedule, ActivationFn, false>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::Sm90CollectiveBuilderGated<
      cutlass::arch::OpClassTensorOp, Element, LayoutA, Align, Element, LayoutB, Align, Acc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<GatedProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::StrideA;
  using StrideB = typename GemmKernel::StrideB;
  using StrideC = typename GemmKernel::StrideC;
  using StrideD = typename GemmKernel::CollectiveEpilogue::FusionCallbacks::Operation::GmemLayoutTagAux;

  static typename Gemm::Arguments arguments(void const* w, void const* x, void const* bias, void* h, int m2, int n,
                                            int k, int sm_count) {
    StrideA sA = cutlass::sm90_make_gated_packed_stride(StrideA{}, {m2, k, 1});
    StrideB sB = cutlass::make_cute_packed_stride(StrideB{}, {n, k, 1});
    StrideC sC = cutlass::sm90_make_gated_packed_stride(StrideC{}, {m2, 1, 1});
    get<1>(sC) = 0;  // a bias broadcast along the columns (read as zero: beta = 0)
    StrideD sD = cutlass::sm90_make_gated_packed_stride(StrideD{}, {m2 / 2, n, 1});
    cutlass::KernelHardwareInfo hw;
    hw.device_id = 0;
    hw.sm_count = sm_count;
    typename Gemm::Arguments args;
    decltype(args.epilogue.thread) fusion{};
    fusion.alpha = 1.f;
    fusion.beta = 0.f;
    fusion.scale_ptr = nullptr;
    fusion.ptr_D = static_cast<Element*>(h);
    fusion.dD = sD;
    auto shape = cutlass::sm90_make_gated_shape<0>(make_shape(m2, n, k, 1));
    return typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGemm, shape,
                                    {static_cast<Element const*>(w), sA, static_cast<Element const*>(x), sB},
                                    {fusion, static_cast<Element const*>(bias), sC, nullptr, {}},
                                    hw, {}};
  }
};

template <class C>
static int run(void const* w, void const* x, void const* bias, void* h, int m2, int n, int k, int sm_count,
               void* workspace, size_t workspace_bytes, void* stream) {
  auto args = C::arguments(w, x, bias, h, m2, n, k, sm_count);
  typename C::Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1;
  if (C::Gemm::get_workspace_size(args) > workspace_bytes) return 2;
  if (gemm.initialize(args, workspace, static_cast<cudaStream_t>(stream)) != cutlass::Status::kSuccess) return 3;
  if (gemm.run(static_cast<cudaStream_t>(stream)) != cutlass::Status::kSuccess) return 4;
  return 0;
}

template <class C>
static size_t workspace(int m2, int n, int k, int sm_count) {
  return C::Gemm::get_workspace_size(C::arguments(nullptr, nullptr, nullptr, nullptr, m2, n, k, sm_count));
}

// The variants: the example's two (pingpong 128×128×64 and cooperative 128×256×64, cluster 1×2×1),
// then each schedule with the other cluster and tiles of 256 weight rows (128 gate + 128 up).
using V0 = Config<true, Shape<_128, _128, _64>, Shape<_1, _2, _1>>;
using V1 = Config<false, Shape<_128, _256, _64>, Shape<_1, _2, _1>>;
using V2 = Config<true, Shape<_128, _128, _64>, Shape<_2, _1, _1>>;
using V3 = Config<false, Shape<_128, _256, _64>, Shape<_1, _1, _1>>;
using V4 = Config<false, Shape<_256, _128, _64>, Shape<_2, _1, _1>>;
using V5 = Config<true, Shape<_128, _64, _64>, Shape<_1, _2, _1>>;
static char const* const NAMES[] = {"pingpong 128x128x64 c1x2", "cooperative 128x256x64 c1x2",
                                    "pingpong 128x128x64 c2x1", "cooperative 128x256x64 c1x1",
                                    "cooperative 256x128x64 c2x1", "pingpong 128x64x64 c1x2"};

extern "C" {
int gated_gemm_variants() { return 6; }
char const* gated_gemm_name(int v) { return (v >= 0 && v < 6) ? NAMES[v] : ""; }
// 0: done; 1: cannot implement; 2: workspace too small; 3: initialize failed; 4: launch failed; 5: no such variant
int gated_gemm_run(int v, void const* w, void const* x, void const* bias, void* h, int m2, int n, int k, int sm_count,
                   void* ws, size_t ws_bytes, void* stream) {
  switch (v) {
    case 0: return run<V0>(w, x, bias, h, m2, n, k, sm_count, ws, ws_bytes, stream);
    case 1: return run<V1>(w, x, bias, h, m2, n, k, sm_count, ws, ws_bytes, stream);
    case 2: return run<V2>(w, x, bias, h, m2, n, k, sm_count, ws, ws_bytes, stream);
    case 3: return run<V3>(w, x, bias, h, m2, n, k, sm_count, ws, ws_bytes, stream);
    case 4: return run<V4>(w, x, bias, h, m2, n, k, sm_count, ws, ws_bytes, stream);
    case 5: return run<V5>(w, x, bias, h, m2, n, k, sm_count, ws, ws_bytes, stream);
    default: return 5;
  }
}
size_t gated_gemm_workspace(int v, int m2, int n, int k, int sm_count) {
  switch (v) {
    case 0: return workspace<V0>(m2, n, k, sm_count);
    case 1: return workspace<V1>(m2, n, k, sm_count);
    case 2: return workspace<V2>(m2, n, k, sm_count);
    case 3: return workspace<V3>(m2, n, k, sm_count);
    case 4: return workspace<V4>(m2, n, k, sm_count);
    case 5: return workspace<V5>(m2, n, k, sm_count);
    default: return 0;
  }
}
}
