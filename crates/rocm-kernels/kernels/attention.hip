// attention kernels: being written.
#include "portability.h"
