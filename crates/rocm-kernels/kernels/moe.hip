// moe kernels: being written.
#include "portability.h"
