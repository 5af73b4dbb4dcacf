"""The scheduler: deadlines (commands a decision sends later) and the due-time store the retry
job shares. :mod:`cqrs.scheduler.records` is what is stored, :mod:`cqrs.scheduler.store` where,
:mod:`cqrs.scheduler.job` the timer that fires what is due."""
