// Grouped GEMM instance: fp8_block, m64_n128_pingpong (see sm90_grouped_gemm_instances.h).
#include "cuda/gemm/sm90_grouped_gemm.cuh"

MOEKIT_SM90_GROUPED_GEMM_INSTANCE(GemmKind::fp8_block, GemmTile::m64_n128_pingpong, fp8_block_m64)
