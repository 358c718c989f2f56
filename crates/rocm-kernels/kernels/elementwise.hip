// elementwise kernels: being written.
#include "portability.h"
