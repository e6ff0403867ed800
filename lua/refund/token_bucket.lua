-- token-bucket: the tokens taken go back into each band's bucket, never
-- past its capacity. Refills since are counted from the same period as
-- before, so the bucket ends where it would be had the request not come.
-- State: `t:k1:l1:k2:l2...` (tokens, time of the last whole refill).
state = read_numbers(raw, tail)
for b = 1, state and P_BANDS or 0 do
  local capacity = args[3 * b - 2]
  local tokens = stored(state[2 * b])
  if tokens then
    state[2 * b] = format('%d', math.min(tokens + cost, capacity))
    changed = true
  end
end
