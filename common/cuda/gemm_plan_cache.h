// The process-wide cache of GEMM plans (gemm_plan.h), shared by all threads.
// Lookups take a shared lock; a miss builds the plan outside any lock and
// inserts it (if two threads build the same plan, the first one inserted
// wins and both use it). Plans are never evicted: there is one per distinct
// GEMM kind, a few hundred bytes each, and callers hold raw pointers to them.
#ifndef FP8KIT_CUDA_GEMM_PLAN_CACHE_H_
#define FP8KIT_CUDA_GEMM_PLAN_CACHE_H_

#include <cstddef>
#include <memory>
#include <shared_mutex>
#include <unordered_map>

#include "gemm_plan.h"

namespace fp8kit {
namespace cuda {

class GemmPlanCache {
 public:
  // The cached plan for `key`, or nullptr.
  const GemmPlan* find(const GemmPlanKey& key) const;
  // Inserts `plan` unless `key` is present; returns the cached plan.
  const GemmPlan* insert(const GemmPlanKey& key, std::unique_ptr<GemmPlan> plan);
  size_t size() const;

 private:
  mutable std::shared_mutex mu_;
  std::unordered_map<GemmPlanKey, std::unique_ptr<GemmPlan>, GemmPlanKeyHash> plans_;
};

GemmPlanCache& gemm_plan_cache();

}  // namespace cuda
}  // namespace fp8kit

#endif  // FP8KIT_CUDA_GEMM_PLAN_CACHE_H_
