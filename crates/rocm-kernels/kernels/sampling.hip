// sampling kernels: being written.
#include "portability.h"
