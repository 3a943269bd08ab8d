-- wrk script: 16 pipelined requests per write (TechEmpower plaintext style).
init = function(args)
  local path = args[1] or "/plaintext"
  local requests = {}
  for i = 1, 16 do requests[i] = wrk.format(nil, path) end
  batch = table.concat(requests)
end

request = function()
  return batch
end
