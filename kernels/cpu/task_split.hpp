// Task lists for the kernels' parallel passes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace moeserve::kernels {

// A run [begin, end) of one job's units (rows, or groups of rows).
struct RangeTask {
  size_t job, begin, end;
};

// A pass hands its tasks out in order and ends when the last one does: the
// tasks holding the last eighth of `total_work` are split into quarter-size
// pieces (of at least `min_units`), so the threads finish within a short task
// of each other instead of a long one. unit_work(job): the work of one unit.
template <class UnitWork>
void SplitTailTasks(std::vector<RangeTask>& tasks, double total_work, UnitWork unit_work, size_t min_units) {
  double tail = 0;
  size_t from = tasks.size();
  while (from > 0 && tail < total_work / 8) {
    const RangeTask& t = tasks[from - 1];
    tail += static_cast<double>(t.end - t.begin) * unit_work(t.job);
    --from;
  }
  const size_t kept = tasks.size();
  for (size_t i = from; i < kept; ++i) {
    const RangeTask t = tasks[i];
    const size_t step = std::max(min_units, (t.end - t.begin + 3) / 4);
    for (size_t b = t.begin; b < t.end; b += step) tasks.push_back({t.job, b, std::min(t.end, b + step)});
  }
  tasks.erase(tasks.begin() + static_cast<long>(from), tasks.begin() + static_cast<long>(kept));
}

}  // namespace moeserve::kernels
