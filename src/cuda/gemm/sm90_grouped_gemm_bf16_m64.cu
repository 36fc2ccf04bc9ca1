// Grouped GEMM instance: bf16, m64_n128_pingpong (see sm90_grouped_gemm_instances.h).
#include "cuda/gemm/sm90_grouped_gemm.cuh"

MOEKIT_SM90_GROUPED_GEMM_INSTANCE(GemmKind::bf16, GemmTile::m64_n128_pingpong, bf16_m64)
