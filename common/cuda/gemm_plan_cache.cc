#include "gemm_plan_cache.h"

#include <mutex>
#include <utility>

namespace fp8kit {
namespace cuda {

const GemmPlan* GemmPlanCache::find(const GemmPlanKey& key) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = plans_.find(key);
  return it == plans_.end() ? nullptr : it->second.get();
}

const GemmPlan* GemmPlanCache::insert(const GemmPlanKey& key, std::unique_ptr<GemmPlan> plan) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto result = plans_.emplace(key, std::move(plan));
  return result.first->second.get();
}

size_t GemmPlanCache::size() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return plans_.size();
}

GemmPlanCache& gemm_plan_cache() {
  // Never destroyed: threads may still run GEMMs while statics are torn down.
  static GemmPlanCache* cache = new GemmPlanCache;
  return *cache;
}

}  // namespace cuda
}  // namespace fp8kit
