// Grouped GEMM instance: bf16, m128_n128_cooperative (see sm90_grouped_gemm_instances.h).
#include "cuda/gemm/sm90_grouped_gemm.cuh"

MOEKIT_SM90_GROUPED_GEMM_INSTANCE(GemmKind::bf16, GemmTile::m128_n128_cooperative, bf16_m128)
