module spindle.test/frameworks/h2c

go 1.24
