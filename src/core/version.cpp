#include "moekit/moekit.h"

namespace moekit {

std::string_view version() { return MOEKIT_VERSION; }

}  // namespace moekit
