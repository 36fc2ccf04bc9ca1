// moekit: the Mixture-of-Experts layer for LLM inference. One include for all of it.
#pragma once

#include "moekit/backend.h"
#include "moekit/comm.h"
#include "moekit/config.h"
#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/quant.h"
#include "moekit/routing.h"
#include "moekit/tensor.h"

namespace moekit {
std::string_view version();
}
