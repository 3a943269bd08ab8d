module spindle.bench/loadpeer

go 1.26.0
