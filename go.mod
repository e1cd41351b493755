module github.com/batonhq/baton

go 1.26.7

require github.com/robfig/cron/v3 v3.0.1

require golang.org/x/sys v0.49.0
