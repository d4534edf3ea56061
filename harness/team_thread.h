#pragma once
// One thread from which every timed OpenMP parallel region starts: the harness runs each CPU sample (its cache
// flush, eviction and run()) there, and the CPU expert engine starts its regions there wherever it is called from.
//
// libgomp keeps a team of worker threads per thread that starts a region, and after each region those workers spin
// for milliseconds before they sleep. The CUDA runtime runs the hybrid step's host functions on threads of its own,
// so the engine's regions started from several of them, and each layer's team worked beside the previous one's
// spinning workers: on the lent H100's 16-core Xeon the engine ran 1.3-1.4x slower inside the step than alone
// (OMP_WAIT_POLICY=passive closed most of that gap at the price of sleeping at every barrier). Alone, the same
// happened the other way round once the engine had moved: the harness's cache flush, a parallel region of the main
// thread, left its team spinning beside the engine's. Started from this one thread, there is one team.
#include <functional>

namespace dslab {

// Runs f on the team thread and waits for it; f's exception is rethrown here. Callers from several threads take
// turns; a call from the team thread itself (a nested one) runs f directly.
void run_on_team_thread(const std::function<void()>& f);

}  // namespace dslab
