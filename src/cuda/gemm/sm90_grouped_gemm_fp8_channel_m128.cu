// Grouped GEMM instance: fp8_channel, m128_n128_cooperative (see sm90_grouped_gemm_instances.h).
#include "cuda/gemm/sm90_grouped_gemm.cuh"

MOEKIT_SM90_GROUPED_GEMM_INSTANCE(GemmKind::fp8_channel, GemmTile::m128_n128_cooperative, fp8_channel_m128)
