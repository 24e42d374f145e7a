// Strategies: see include/hpm/dist/strategy.h (in progress).
namespace hpm::dist {}
