def difference_of_numbers(a, b):
    return a - b
