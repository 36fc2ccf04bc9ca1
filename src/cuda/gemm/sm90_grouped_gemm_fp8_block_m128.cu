// Grouped GEMM instance: fp8_block, m128_n128_cooperative (see sm90_grouped_gemm_instances.h).
#include "cuda/gemm/sm90_grouped_gemm.cuh"

MOEKIT_SM90_GROUPED_GEMM_INSTANCE(GemmKind::fp8_block, GemmTile::m128_n128_cooperative, fp8_block_m128)
