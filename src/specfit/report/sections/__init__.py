"""The report's sections, in the page's order: ``PER_DEVICE`` for each (model, device) of the run, then
``ACROSS_DEVICES`` for each model. Each is a function from its scope (`specfit.report.scope`) to one `Section`, or
None when the configuration gives it nothing to show (a method beyond the paper that is not configured)."""

from specfit.report.sections import (
                                     calibration,
                                     claims,
                                     counters,
                                     devices,
                                     learned_routes,
                                     lossless,
                                     noisy_routes,
                                     paper_headline,
                                     prefetch,
                                     proportions,
                                     resident,
                                     sampling,
                                     selection_cost,
                                     specfit_ca,
                                     sweep,
                                     theory,
                                     throughput,
                                     tuned,
)

PER_DEVICE = (claims.section, proportions.section, throughput.section, tuned.section, sampling.section,
              specfit_ca.section,
              prefetch.section, learned_routes.section, counters.section, sweep.section, theory.section,
              calibration.section, selection_cost.section, noisy_routes.section, lossless.section)
ACROSS_DEVICES = (devices.section, resident.section, paper_headline.section)
